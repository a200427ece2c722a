# Compiled, Forwarder is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour; an attribute
# not declared here lives in the instance __dict__ as before.
cdef class Forwarder:
    cdef dict __dict__
    cdef public object client
    cdef public object session
    cdef public object release
    cdef public object abort_timeout_s
    cdef public object aborts
    cdef public object abort_failures
    cdef public object _tasks
