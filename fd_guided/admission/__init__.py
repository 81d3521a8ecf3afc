"""Admission: a request's guided fields read, bounded and checked into one `GrammarSpec`.

One concern per module: `spec` (the admitted constraint, `GrammarSpec`/`JsonFormat`), `parse`
(request fields -> spec), `documents` (plain JSON: decoding, types, depth, text), `meta` (the
meta-schema check and references), `syntax` (EBNF and Lark grammars), `cache` (admission results by
canonical hash). The bounds are a foundation below config (`fd_guided.limits`), and how a schema
without ``$schema`` is read belongs to the normaliser's reader (`fd_guided.schema.drafts`), which
admission imports: imports run admission -> schema, never back. Nothing is imported here; the
public names are re-exported by `fd_guided` and `fd_guided.spec`.
"""
