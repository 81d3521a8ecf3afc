"""Asynchronous grammar compilation in killable workers: tickets, budgets, caches, fallback.

The map (one module per concern):
  service.py     `CompileService`: per-request tickets over per-engine jobs, fallback, lifetime
  tickets.py     `Ticket`: which engine's outcome settles a request, and how long it waits for a preferred one
  jobs.py        `CompileJobs`: per-engine jobs: L1/L2 caches, in-flight sharing, loading, the cache-only backlog
  pool.py        `CompileProcessPool`: forked worker processes, their queue and dispatch; the cache-only lane
  supervisor.py  `WorkerSupervisor`: one busy worker's reply, time and memory budgets, demotion, kill
  zygote.py      the per-tokenizer processes workers are forked from
  worker.py      what runs inside the zygote and worker processes
  cache.py       the byte-bounded LRU of compiled grammars and the memory of failed compiles
  threads.py     deep-stack threads for native compilers
"""

from .cache import CompiledGrammarCache, RememberedErrors
from .service import CompileService, SharedGrammarCache, join

__all__ = ["CompileService", "CompiledGrammarCache", "RememberedErrors", "SharedGrammarCache", "join"]
