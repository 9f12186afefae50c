"""Text generation with an LLM for the views that need one (SemCSE's summaries): vLLM, or
transformers `generate` where vLLM is missing. Imports no stage."""
