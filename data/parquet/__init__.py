"""A Parquet click log read in place: its files and partitions (files), the columns' roles
(columns), the splits and time windows (split, windows), the per-rank streaming loader
(loader), and raw ids hashed into the tables (id_hashing, id_collisions).

Imports nothing: each module loads what it needs (some need no torch).
"""
