"""Plugin modules only the tests define (a toy task, a toy model family), imported through S2SJAX_PLUGINS."""
