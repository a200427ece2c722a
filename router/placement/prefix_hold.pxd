# Compiled, PrefixHold is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour; an attribute
# not declared here lives in the instance __dict__ as before.
cdef class PrefixHold:
    cdef dict __dict__
    cdef public object enabled
    cdef public object wait_s
    cdef public object min_tokens
    cdef public object spills
    cdef public object committed_prefix
    cdef public object routable
    cdef public object queued_cost_before
    cdef public object clock
