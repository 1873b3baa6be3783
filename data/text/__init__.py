"""Text rows: Criteo's TSV days (criteo_tsv), CSV rows (csv_rows), and reading lines
in blocks (text_lines).

Imports nothing: each module loads what it needs (some need no torch).
"""
