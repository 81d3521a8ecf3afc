"""Asynchronous grammar compilation in killable workers: tickets, budgets, caches, fallback.

The map (one module per concern):
  service.py  `CompileService`: per-request tickets over per-engine jobs, L1/L2 caches, fallback
  tickets.py  `Ticket`: which engine's outcome settles a request, and how long it waits for a preferred one
  pool.py     `CompileProcessPool`: forked worker processes with time and memory budgets; the cache-only lane
  zygote.py   the per-tokenizer processes workers are forked from
  worker.py   what runs inside the zygote and worker processes
  cache.py    the byte-bounded LRU of compiled grammars and the memory of failed compiles
  threads.py  deep-stack threads for native compilers
"""

from .cache import CompiledGrammarCache, RememberedErrors
from .service import CompileService, SharedGrammarCache, join

__all__ = ["CompileService", "CompiledGrammarCache", "RememberedErrors", "SharedGrammarCache", "join"]
