-- A stand-in for scrun: loads a scrun.lua with a `slurm` table that implements the part of
-- scrun's Lua API the stage hooks use, calls one hook and prints what happened as JSON.
--
-- lua5.3 scrun_harness.lua SCRUN_LUA stage-in ID BUNDLE SPOOL CONFIG JOB UID GID ENV_JSON
-- lua5.3 scrun_harness.lua SCRUN_LUA stage-out ID BUNDLE ORIG_BUNDLE ROOT ORIG_ROOT SPOOL
--                                              CONFIG JOB UID GID
local json = require("cjson")

local state = {calls = {}, logs = {}}

-- HARNESS_REAPED=1: report the exit status as scrun does when its SIGCHLD handler reaped the
-- command's child first (run_command's waitpid fails with ECHILD and the status it returns
-- was never filled: any number), with the command's whole output
local reaped = os.getenv("HARNESS_REAPED") == "1"

local function run(kind, command)
	local pipe = io.popen(command, "r")
	local output = pipe:read("a")
	local ok, _, code = pipe:close()
	local rc = ok and 0 or (code or 1)
	if reaped then
		rc = 255
	end
	state.calls[#state.calls + 1] = {kind = kind, command = command, rc = rc, output = output}
	return rc, output
end

local function logger(level)
	return function(message)
		state.logs[#state.logs + 1] = level .. ": " .. message
		io.stderr:write(level .. ": " .. message .. "\n")
	end
end

slurm = {
	SUCCESS = 0,
	ERROR = -1,
	log_error = logger("error"),
	log_info = logger("info"),
	log_verbose = logger("verbose"),
	log_debug = logger("debug"),
	set_bundle_path = function(path) state.bundle_path = path end,
	set_root_path = function(path) state.root_path = path end,
	allocator_command = function(command) return run("allocator", command) end,
	remote_command = function(command) return run("remote", command) end,
}

local script, hook = arg[1], arg[2]
state.load_rc = dofile(script)
if hook == "stage-in" then
	local env = json.decode(arg[10])
	state.rc = slurm_scrun_stage_in(arg[3], arg[4], arg[5], arg[6], tonumber(arg[7]),
		tonumber(arg[8]), tonumber(arg[9]), env)
elseif hook == "stage-out" then
	state.rc = slurm_scrun_stage_out(arg[3], arg[4], arg[5], arg[6], arg[7], arg[8], arg[9],
		tonumber(arg[10]), tonumber(arg[11]), tonumber(arg[12]))
else
	error("unknown hook " .. tostring(hook))
end
print(json.encode(state))
