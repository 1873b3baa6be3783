"""The names and version of a delta export's own files (serving/delta.py writes and
reads them; the daily loop, which does not import serving, measures them): one source
for both, so a new version of delta.json is one edit (the loop once refused its own
deltas for a version number written in two places)."""

DELTA_FILE = "delta.json"
# 2: the seen-id filters may be a delta too, their changed bytes (DeltaRecord.sketch, SKETCH_DELTA_FILE);
# 3: the bits they gained instead, gap-coded (DeltaRecord.sketch_bits). Versions 2 and 1 are read.
DELTA_VERSION = 3
# The seen-id filters' change since the base's id_sketch.bin: the bits each gained (version 2: bytes).
SKETCH_DELTA_FILE = "id_sketch.delta"
