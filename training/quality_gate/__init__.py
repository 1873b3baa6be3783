"""``python -m training.quality_gate`` only: moved to python -m serving.quality_gate; this alias goes away in the next release."""
