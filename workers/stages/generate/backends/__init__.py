"""Generation backends behind one interface (base.py): transformers (hf.py) and vLLM
(vllm.py; the server lifecycle is workers/stages/vllm_server.py). Import the one you need; each
pulls its heavy dependencies only when constructed."""
