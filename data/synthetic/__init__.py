"""Made-up data: uniform random batches (random_data; the generators
data.synthetic_criteo, data.synthetic_csv and data.synthetic_parquet write files).

Imports nothing: each module loads what it needs (some need no torch).
"""
