"""Serving: export a training checkpoint, predict, gate quantized variants, serve over HTTP.

    python -m serving.export --checkpoint CKPT --output MODEL_DIR
    python -m serving.predict --model MODEL_DIR --input day_23.tsv
    python -m serving.quality_gate --model MODEL_DIR
    python -m serving.serve --model MODEL_DIR --port 8080

Serving builds on ``training`` (checkpoints), ``models`` and ``data`` (the Criteo
transforms); nothing there imports serving.
"""
