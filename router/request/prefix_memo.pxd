# Compiled, PrefixMemo is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour; an attribute
# not declared here lives in the instance __dict__ as before.
cdef class PrefixMemo:
    cdef dict __dict__
    cdef public object rule
    cdef public object _encode_plain
    cdef public object _encode_full
    cdef public object prefix
    cdef public object suffix
    cdef public object segment_chars
    cdef public object budget_tokens
    cdef public object check_every
    cdef public object check_every_max
    cdef public object enabled
    cdef public object disabled_reason
    cdef public object stats
    cdef public object tokens
    cdef public object _root
    cdef public object _clock
    cdef public object _ghosts
    cdef public object _hints
    cdef public object _hint_ids
    cdef public object _lock
    cdef public object _since_check
    cdef public object _clean_at_interval
