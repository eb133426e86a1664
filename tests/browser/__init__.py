"""Real-browser tests of the operator console (Chromium via Selenium; docs/console-dom.md)."""
