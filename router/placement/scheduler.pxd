# Compiled, Scheduler is an extension type (setup.py, Cython): its methods read the attributes declared here as struct
# fields instead of looking each up by name. The .py beside this file is the source of its behaviour; an attribute
# not declared here lives in the instance __dict__ as before.
cdef class Scheduler:
    cdef dict __dict__
    cdef public object cfg
    cdef public object pool
    cdef public object index
    cdef public object ledger
    cdef public object clock
    cdef public object queue
    cdef public object stats
    cdef public object queue_wait
    cdef public object scan_all
    cdef public object ahead
    cdef public object policy
    cdef public object fast_path
    cdef public object holds
    cdef public object last_deferred
    cdef public object _view
    cdef public object _decision_window
    cdef public object pump_soon
    cdef public object on_load
