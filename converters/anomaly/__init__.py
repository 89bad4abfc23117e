"""Anomaly bundles taught from images of good parts (PatchCore): the backbone (:mod:`converters.anomaly.backbone`)
and the teach step (:mod:`converters.anomaly.teach`); runtime.classify.anomaly runs what they make."""
