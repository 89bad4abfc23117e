"""Audio model conversion (issue 4, second half): not implemented yet.

``edgerun convert audio`` stays absent until converters/audio/cli.py exists.
"""
