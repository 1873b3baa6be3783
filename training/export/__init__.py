"""``python -m training.export`` only: moved to python -m serving.export; this alias goes away in the next release."""
