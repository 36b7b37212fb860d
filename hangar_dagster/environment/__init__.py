"""What a trial's environment is made of beyond the sandbox itself.

The package mirror trials and graders install from, the egress proxy that is a
sandbox's only way out, the environment builds (a task's dependencies, built
once and mounted read-only into every trial and grader of that task), and the
base images the Docker backend runs.
"""
