# /etc/profile inside a hangar sandbox (bound over the system's; docs/architecture.md, "One
# environment for every shell"). A login shell (`bash -lc`, `sh -l`) reads this file: it leaves
# the environment the sandbox was started with as it is, so a command an agent CLI runs through
# a login shell sees the same PATH (the trial's venv first), interpreter and variables as the
# trial's verify step. The system's /etc/profile would reset PATH and drop the venv.
