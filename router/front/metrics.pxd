# Compiled, Tally is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour. No instance
# __dict__: a Tally holds these three alone (it had __slots__ before).
cdef class Tally:
    cdef public object bounds
    cdef public object counts
    cdef public object sum
