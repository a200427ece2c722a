# Compiled, ArrivalOrder is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour; an attribute
# not declared here lives in the instance __dict__ as before.
cdef class ArrivalOrder:
    cdef dict __dict__
    cdef public object _issued
    cdef public object _turn
    cdef public object _left
    cdef public object _waiting
