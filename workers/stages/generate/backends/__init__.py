"""Generation backends behind one interface (base.py): transformers (hf.py) and vLLM
(vllm.py, with the server lifecycle in vllm_server.py). Import the one you need; each
pulls its heavy dependencies only when constructed."""
