# Compiled, LoadOrder is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour; an attribute
# not declared here lives in the instance __dict__ as before.
cdef class LoadOrder:
    cdef dict __dict__
    cdef public object key
    cdef public object uniform
    cdef public object built_after
    cdef public object single_slot
    cdef public object theta
    cdef public object mask
    cdef public object owner
    cdef public object bits
    cdef public object members
    cdef public object stale
    cdef public object _entries
    cdef public object _groups
