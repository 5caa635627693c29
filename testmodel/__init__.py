"""The scripted model server for tests, demos and benchmarks: `model_server` (a
local OpenAI- and Anthropic-compatible HTTP server with scripted, pluggable
policies; `python -m testmodel.model_server`), its ChatML prompt parser
(`chatml`) and a toy tokenizer (`tokenizer`)."""
