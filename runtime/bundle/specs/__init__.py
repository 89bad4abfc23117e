"""The model-kind sections of a bundle manifest, one module per kind: what the runtime needs to run a language
model (:mod:`runtime.bundle.specs.llm`), an image classifier (:mod:`runtime.bundle.specs.vision`), an audio classifier
(:mod:`runtime.bundle.specs.audio`) or an anomaly detector (:mod:`runtime.bundle.specs.anomaly`), each parsed and validated from
the manifest's JSON. The tensor quantization the classifier kinds share is :mod:`runtime.bundle.specs.tensor`; the
envelope that holds a section is runtime/bundle/manifest.py."""
