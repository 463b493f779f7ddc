"""A plain Python base class that lets a compiled class be weakly referenced.

mypyc (appbridge/compiled.py) gives a native class a ``__weakref__`` slot only when the class
inherits from a class that is not compiled. This module is never compiled, so a compiled class
that derives from :class:`Weakable` keeps its fast, fixed attributes and can still be held
through ``weakref.ref``: the call, held so by its command handler.
"""


class Weakable:
    """Derive from this to be weakly referenceable once compiled. Adds nothing else."""
