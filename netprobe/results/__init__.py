"""Logic over many results, never printing: reading saved results back (:mod:`.saved`),
statistics of repeated measurements (:mod:`.stats`), grouping and figures for a report
(:mod:`.analysis`), trials run N times or through several tools (:mod:`.trials`) and the
segments of a path (:mod:`.path`). The CLI renders what these return.
"""
