# Compiled, PlacementPolicy is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour; an attribute
# not declared here lives in the instance __dict__ as before.
cdef class PlacementPolicy:
    cdef dict __dict__
    cdef public object cfg
    cdef public object clock
    cdef public object stats
    cdef public object queued_cost_before
    cdef public object _rr
    cdef public object last_by_load
    cdef public object defer_spills
    cdef public object homes
