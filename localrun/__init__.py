"""Starting and stopping the local processes of a run or a test: Azurite, and the process
groups of devhost, localbus and the simulator (what `make run` and the tests start, by process
id, and stop). Not part of the app, nor of devhost: the host runs functions, this runs hosts."""
