"""``python -m training.predict`` only: moved to python -m serving.predict; this alias goes away in the next release."""
