"""Pieces every part of the project uses and that belong to none of them."""
