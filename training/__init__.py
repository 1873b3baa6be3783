"""Training: the loop, evaluation, logging and the pieces they are built from."""
