"""Audio model conversion: a classifier or detector plus its feature front end into a quantized, gated bundle."""
