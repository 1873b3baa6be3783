"""Turning raw data into the files training reads: Criteo's transforms
(criteo_transforms; the CLIs data.preprocess_criteo and data.transcode use them).

Imports nothing: each module loads what it needs (some need no torch).
"""
