"""``python -m training.serve`` only: moved to python -m serving.serve; this alias goes away in the next release."""
