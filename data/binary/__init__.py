"""Binary files read in memory or memory-mapped: Criteo's day files and their layout
(criteo, criteo_layout), split_binary feature specs (split, feature_spec), and the
page release of mapped files (mapped_pages).

Imports nothing: each module loads what it needs (some need no torch).
"""
