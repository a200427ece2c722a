# Compiled, PieceCache is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour; an attribute
# not declared here lives in the instance __dict__ as before.
cdef class PieceCache:
    cdef dict __dict__
    cdef public object _encode_plain
    cdef public object _encode_new
    cdef public object _joined
    cdef public object _added
    cdef public object _reach
    cdef public object _ascii_only
    cdef public object _known
    cdef public object _table
    cdef public object hits
    cdef public object misses
    cdef public object whole
