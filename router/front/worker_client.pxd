# Compiled, WorkerClient is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour; an attribute
# not declared here lives in the instance __dict__ as before.
cdef class WorkerClient:
    cdef dict __dict__
    cdef public object total_timeout_s
    cdef public object connect_timeout_s
    cdef public object keepalive_s
    cdef public object _fixed
    cdef public object _idle
    cdef public object _origins
    cdef public object _ssl
    cdef public object connections_made
    cdef public object closed
