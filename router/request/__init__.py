"""From a request's body to what placement needs: parsing and limits, token ids (tokenizer, prefix memo, chat and
decision prompts) and SGLang's page hashes. Nothing here knows about workers."""
