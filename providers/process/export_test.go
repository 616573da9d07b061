package process

// AgentHardware is the default Hardware over opts, for tests that wrap it.
func AgentHardware(opts Options) Hardware { return agents{opts: opts} }
