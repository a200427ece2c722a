# Compiled, RouterTokenizer is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour; an attribute
# not declared here lives in the instance __dict__ as before.
cdef class RouterTokenizer:
    cdef dict __dict__
    cdef public object hf
    cdef public object exact
    cdef public object inexact_reason
    cdef public object special_tokens
    cdef public object backend
    cdef public object _stock
    cdef public object memo
    cdef public object plain_memo
    cdef public object pieces
    cdef public object memo_off_reason
