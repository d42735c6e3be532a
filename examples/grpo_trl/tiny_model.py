"""A tiny causal LM built from a config (no download), and a loopback endpoint that samples it.

``char_tokenizer()`` is a character-level tokenizer made in code; ``tiny_model()`` a two-layer
Llama with random weights. ``ModelServer`` serves ``POST /generate {"prompt": ...}`` from the
trainer's own model on 127.0.0.1 (the agents' ``policy_endpoint``): it samples a one-token
answer among the digits (constrained decoding: a random model would almost never write a
digit alone) and returns its token ids and log-probability, as a vLLM server would for a real
model. A lock keeps sampling out of the optimizer step.
"""

from __future__ import annotations

import json
import string
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL = {"<pad>": 0, "<eos>": 1, "<unk>": 2}


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable character, plus pad, eos and unk."""
    vocab = dict(SPECIAL)
    for char in string.printable:
        if char not in "\t\n\r\x0b\x0c":
            vocab[char] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def tiny_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                         pad_token_id=SPECIAL["<pad>"], eos_token_id=SPECIAL["<eos>"], bos_token_id=SPECIAL["<eos>"])
    return LlamaForCausalLM(config)


class ModelServer:
    """Samples the trainer's model for the agents, on a loopback port, in a thread."""

    def __init__(self, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.allowed = torch.tensor(tokenizer.convert_tokens_to_ids(list(string.digits)))
        self.lock = threading.Lock()  # held by the trainer around each optimizer step
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                reply = json.dumps(server.generate(str(body["prompt"]))).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> ModelServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @torch.no_grad()
    def generate(self, prompt: str) -> dict[str, Any]:
        prompt_ids = self.tokenizer(prompt)["input_ids"]
        with self.lock:
            logits = self.model(torch.tensor([prompt_ids])).logits[0, -1].float()
        masked = torch.full_like(logits, float("-inf"))
        masked[self.allowed] = logits[self.allowed]
        dist = torch.distributions.Categorical(logits=masked)
        token = int(dist.sample())
        return {"prompt_ids": prompt_ids, "completion_ids": [token],
                "logprobs": [float(dist.log_prob(torch.tensor(token)))], "text": self.tokenizer.decode([token])}
