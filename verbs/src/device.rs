//! Device discovery without sysfs (`ibv_get_device_list` and friends). OWNER: helper "device".
