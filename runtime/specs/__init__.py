"""The model-kind sections of a bundle manifest, one module per kind: what the runtime needs to run a language
model (:mod:`runtime.specs.llm`), an image classifier (:mod:`runtime.specs.vision`), an audio classifier
(:mod:`runtime.specs.audio`) or an anomaly detector (:mod:`runtime.specs.anomaly`), each parsed and validated from
the manifest's JSON. The tensor quantization the classifier kinds share is :mod:`runtime.specs.tensor`; the
envelope that holds a section is runtime/bundle.py."""
