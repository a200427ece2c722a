# Compiled, FastPath is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour; an attribute
# not declared here lives in the instance __dict__ as before.
cdef class FastPath:
    cdef dict __dict__
    cdef public object cfg
    cdef public object index
    cdef public object policy
