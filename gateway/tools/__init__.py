"""Tool calls and structured output for every entry point (REST chat, realtime): what a request's
`tools` / `tool_choice` / `response_format` mean (`spec.py`), and the calls in the model's text
(`parser.py`). Torch-free and xgrammar-free: the thinker compiles and enforces the grammars."""
