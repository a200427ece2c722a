# Compiled, Router is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour; an attribute
# not declared here lives in the instance __dict__ as before.
cdef class Router:
    cdef dict __dict__
    cdef public object cfg
    cdef public object sockets
    cdef public object owner
    cdef public object fronts
    cdef public object index
    cdef public object ledger
    cdef public object session
    cdef public object pool
    cdef public object scheduler
    cdef public object lane
    cdef public object metrics
    cdef public object suspects
    cdef public object forwarder
    cdef public object _tasks
    cdef public object order
    cdef public object _pump_due
    cdef public object peers
    cdef public object bare_counts
