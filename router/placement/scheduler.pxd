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
