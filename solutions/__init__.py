"""Reference answers to `fusionlab.exercises`, and one planted wrong answer per exercise (a plausible mistake).

Kept outside the notebooks and outside the importable package: `tests/test_exercises.py` proves each reference
passes its checker and each wrong answer fails it on the case the mistake shows in.
"""
