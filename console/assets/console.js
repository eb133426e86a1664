// Auto-refresh of list and detail pages (data-refresh seconds on <body>), paused while
// the person is typing in a form or has text selected, and by the page's own
// "Pause auto-refresh" link (refresh=off in the URL, so a shared link keeps it).
(function () {
  "use strict";
  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (!seconds) { return; }
  var busy = false;
  document.addEventListener("input", function () { busy = true; });
  document.addEventListener("focusin", function (e) {
    if (e.target && /^(INPUT|TEXTAREA|SELECT)$/.test(e.target.tagName)) { busy = true; }
  });
  window.setInterval(function () {
    var selected = window.getSelection && String(window.getSelection()).length > 0;
    var open = document.querySelector("details[open]");
    if (!busy && !selected && !open && document.visibilityState === "visible") {
      window.location.reload();
    }
  }, seconds * 1000);
})();
