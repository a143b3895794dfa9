"""The description of a pipeline and what reads it: ``PipelineSpec`` (stages, edges,
inputs, outputs, options), its parsing, the pipeline file, the build that hands it to the
core, opset conversion, and the drawing of the plan the core returns. Below the runtime:
nothing here creates a session."""
