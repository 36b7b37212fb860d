"""Grading: hidden tests run against a trial's patch, and the grade made from what they report.

``hangar_grade`` is the ``hangar-grade`` runner that executes inside the grader
sandbox; ``grader`` drives it from the host (clone, patch, hidden files,
sandbox, JUnit) and builds ``GradeRecord`` / ``BaseCheckRecord`` rows;
``junit`` and ``signals`` are pure readers of a report and of a patch.
docs/grading.md explains the whole path and what each part defends against.
"""
