# Compiled, WorkerPool is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour; an attribute
# not declared here lives in the instance __dict__ as before.
cdef class WorkerPool:
    cdef dict __dict__
    cdef public object cfg
    cdef public object index
    cdef public object ledger
    cdef public object on_change
    cdef public object workers
    cdef public object tokenizer
    cdef public object tokenizer_source
    cdef public object plain
    cdef public object discovery
    cdef public object health
    cdef public object events
    cdef public object limits
    cdef public object _reference
    cdef public object _next_id
    cdef public object _slot_owner
    cdef public object _adding
    cdef public object tokenizer_mismatches
    cdef public object _closing
    cdef public object calibrations
    cdef public object installs
