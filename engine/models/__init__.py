"""Loading models: Hugging Face folders and hub ids, GGUF files, the catalog, chat templates."""
