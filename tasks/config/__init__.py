"""Experiment configuration: one pydantic model per section, one module per topic, and one
`PipelineConfig` (pipeline.py) per YAML file, loaded by loading.py.

Unknown keys are errors, every field has a description (it is the help text users read), and
`load_config` reports problems as `file: section.field: message`.
"""
